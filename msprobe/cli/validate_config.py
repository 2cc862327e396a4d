"""``msprobe validate-config CONFIG``: check a config.json before a long job starts (strict)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("validate-config",
                       help="check a config.json as PrecisionDebugger reads it, strictly: an unknown or misspelt "
                            "key is an error naming the nearest valid key")
    p.add_argument("config", help="the config.json")
    p.set_defaults(func=run)


def run(args) -> int:
    import warnings

    from msprobe.cli._text import say
    from msprobe.dumpers.config import load_config, read_config_json, unknown_keys
    from msprobe.errors import ConfigError

    raw = read_config_json(args.config)
    unknown = unknown_keys(raw)
    if unknown:
        raise ConfigError(f"{args.config}: " + "; ".join(f"unknown key {k}{hint}" for k, hint in unknown))
    with warnings.catch_warnings(record=True) as caught:  # what load_config would warn about: said below
        warnings.simplefilter("always")
        cfg = load_config(args.config)

    def some(v) -> str:
        return "all" if not v else ",".join(str(x) for x in sorted(v))

    say(f"{args.config}: valid; task {cfg.task}, level {cfg.level}, step(s) {some(cfg.step)}, "
        f"rank(s) {some(cfg.rank)}, dump_path {cfg.dump_path}, list {cfg.list or 'all'}, "
        f"scope {cfg.scope or 'none'}, data_mode {cfg.data_mode}, run_dir_policy {cfg.run_dir_policy}")
    for w in caught:
        say(f"note: {w.message}")
    return 0
