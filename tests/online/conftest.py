"""Helpers of the online run_ut tests: the checker and the training run as two processes."""
from __future__ import annotations

import csv
import datetime
import glob
import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train_online.py")


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return e


def write_json(path, obj) -> str:
    with open(path, "w") as fh:
        json.dump(obj, fh)
    return str(path)


def training_config(tmp_path, **online) -> str:
    top = {k: online.pop(k) for k in ("storage_options",) if k in online}
    cfg = {"task": "tensor", "dump_path": str(tmp_path / "dump_unused"), "level": "L1",
           "tensor": dict({"online_run_ut": True, "scope": [], "list": []}, **online)}
    cfg.update(top)
    return write_json(tmp_path / "train_config.json", cfg)


def checker_config(tmp_path, **online) -> str:
    top = {k: online.pop(k) for k in ("storage_options",) if k in online}
    cfg = {"task": "run_ut", "run_ut": dict({"white_list": [], "black_list": [], "error_data_path": "./",
                                             "is_online": True, "rank_list": [0]}, **online)}
    cfg.update(top)
    return write_json(tmp_path / "checker_config.json", cfg)


def start_checker(config: str, out: str, *extra: str) -> subprocess.Popen:
    # the docs' form: ``msprobe run_ut -config config.json`` with is_online in the run_ut section
    cmd = [sys.executable, "-m", "msprobe", "run_ut", "-config", config, "-o", out,
           "--idle-timeout", "90", *extra]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_training(config: str, steps: int = 1, extra_env: dict = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, TRAIN, config, str(steps)], env=dict(env(), **(extra_env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def training_result(p: subprocess.Popen, timeout: float = 150) -> dict:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, out + err
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert line, out + err
    res = json.loads(line[-1][len("RESULT "):])
    res["log"] = err
    return res


def run_training(config: str, steps: int = 2, timeout: float = 150) -> dict:
    p = subprocess.run([sys.executable, TRAIN, config, str(steps)], env=env(), capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, p.stdout + p.stderr
    res = json.loads(line[-1][len("RESULT "):])
    res["log"] = p.stderr
    return res


def finish(proc: subprocess.Popen, timeout: float = 150) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("checker did not finish:\n" + out) from None
    assert proc.returncode == 0, out
    return out


def wait_for(path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def result_rows(out_dir: str, rank: int = 0) -> list:
    files = glob.glob(os.path.join(out_dir, f"accuracy_checking_result_*_rank{rank}.csv"))
    assert len(files) == 1, files
    with open(files[0], newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "API name"
    return rows[1:]


def details_rows(out_dir: str, rank: int = 0) -> list:
    files = glob.glob(os.path.join(out_dir, f"accuracy_checking_details_*_rank{rank}.csv"))
    assert len(files) == 1, files
    with open(files[0], newline="", encoding="utf-8-sig") as fh:
        return list(csv.reader(fh))[1:]


def assert_covers(out_dir: str, sent: dict, rank: int = 0) -> list:
    """Every API the training side queued has exactly its number of result rows."""
    rows = result_rows(out_dir, rank)
    got = Counter(r[0] for r in rows)
    assert got == Counter(sent["forward_counts"]), (got, sent["forward_counts"])
    return rows


# ------------------------------------------------------------------ certificates
def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject_cn, key, issuer_cn, issuer_key, *, ca: bool):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
         .public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                          crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path, key=None, cert=None):
    from cryptography.hazmat.primitives import serialization

    if key is not None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    else:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@pytest.fixture(scope="session")
def tls_dirs(tmp_path_factory):
    """{"server": dir, "client": dir, "rogue": dir}: server/client signed by one CA; the rogue
    client's certificate is signed by another CA (and trusts the real one)."""
    pytest.importorskip("cryptography")
    base = tmp_path_factory.mktemp("tls")
    ca_key, rogue_ca_key = _key(), _key()
    ca = _cert("msprobe test CA", ca_key, "msprobe test CA", ca_key, ca=True)
    rogue_ca = _cert("rogue CA", rogue_ca_key, "rogue CA", rogue_ca_key, ca=True)
    out = {}
    for role, issuer, issuer_key, issuer_cn in (("server", ca, ca_key, "msprobe test CA"),
                                                ("client", ca, ca_key, "msprobe test CA"),
                                                ("rogue", rogue_ca, rogue_ca_key, "rogue CA")):
        d = base / role
        d.mkdir()
        file_role = "server" if role == "server" else "client"
        k = _key()
        _write(d / f"{file_role}.key", key=k)
        _write(d / f"{file_role}.crt", cert=_cert(f"{role}.example.com", k, issuer_cn, issuer_key, ca=False))
        _write(d / "ca.crt", cert=ca)
        out[role] = str(d)
    return out


class ThreadChecker:
    """The checker run in the test's own process (a thread), the training run being the other process."""

    def __init__(self, config: str, out: str, **kw):
        import threading

        from msprobe.run_ut import load_run_ut_config
        from msprobe.run_ut.online import OnlineChecker, settings_from_config

        settings, _ = settings_from_config(config)
        lists = load_run_ut_config(config)
        self.listening = threading.Event()
        self.checker = OnlineChecker(settings, out, white_list=lists.get("white_list", ()),
                                     black_list=lists.get("black_list", ()), idle_timeout=kw.pop("idle_timeout", 90),
                                     on_listen=lambda port: self.listening.set(), **kw)
        self.summary = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if settings.transport != "store":
            assert self.listening.wait(30), "the checker never listened"

    def _run(self):
        try:
            self.summary = self.checker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    @property
    def port(self) -> int:
        return self.checker.port

    def join(self, timeout: float = 150) -> dict:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.checker.stop()
            self.thread.join(10)
            raise AssertionError("checker did not finish")
        if self.error is not None:
            raise self.error
        return self.summary
