"""``msprobe convert PATH --to classic|zarr [--out URL]``: tensor files <-> the Zarr tensor store."""
from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    parser = sub.add_parser("convert", help="convert a tensor dump between dump_tensor_data/ files and the Zarr store")
    parser.add_argument("path", help="dump root, step or rank directory, or URL")
    parser.add_argument("--to", required=True, choices=["classic", "zarr"],
                   help="classic: one .pt/.npy file per tensor (msprobe); zarr: tensors.zarr (spec section 21)")
    parser.add_argument("-o", "--output-path", "--out", dest="out", default=None, help="write the converted dump here (default: convert in place)")
    parser.add_argument("--storage-options", default=None, help="JSON object of fsspec storage options")
    parser.add_argument("--compression", default="zstd", choices=["zstd", "zstd-byteshuffle", "lz4", "none"],
                   help="--to zarr: the codec of the inner chunks (default zstd: blosc zstd-1 bitshuffle, the smallest; the dumper defaults to lz4, the cheapest)")
    parser.add_argument("--shard-mb", type=int, default=128, help="--to zarr: raw MiB per shard object (default 128)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from msprobe.convert import convert

    opts = json.loads(args.storage_options) if args.storage_options else None
    stats = convert(args.path, args.to, args.out, storage_options=opts, shard_mb=args.shard_mb,
                    compression=args.compression)
    print(f"msprobe convert --to {args.to}: {stats['converted_rank_dirs']} of {stats['rank_dirs']} rank dir(s) "
          f"converted, {stats['tensors']} tensor(s) -> {args.out or args.path}")
    return 0
