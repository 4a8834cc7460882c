"""``opdump convert``: Ascend bin dump files -> ``.npy`` files (README, "opdump convert").

A thin layer over :func:`opdump.analysis.convert.convert`; each ``.npy`` is written by
:func:`opdump.write.atomic.atomic_save_npy` (whole, through a temporary name).
Exit code: 0 every file converted, 2 an error (a malformed file -- named on stderr with
the reason, its tensors not written --, nothing to convert, a missing path).
"""
from __future__ import annotations

import sys

#: ``-f`` values: the host layout (each device format has exactly one) or the device's
HOST_LAYOUTS = ("NCHW", "NCDHW", "ND")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "convert", help="convert Ascend bin dump files (opdump's or the toolchain's) to .npy files",
        description="One .npy per input/output of each bin dump file, named "
                    "<file>.<input|output>.<i>.<d0xd1x...>.npy. Device formats (NC1HWC0, NDC1HWC0, "
                    "FRACTAL_Z, FRACTAL_Z_3D, FRACTAL_NZ, C1HWNCoC0) become NCHW/NCDHW/ND with padding "
                    "removed; bfloat16/float8 are saved as float32, int4 as int8. "
                    "Exit code: 0 converted, 2 error.")
    p.add_argument("-d", "--dump", dest="src", required=True, metavar="PATH",
                   help="a bin dump file, or a folder: every bin file under it (sub-folders kept)")
    p.add_argument("-out", "--out", dest="out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument("-f", "--format", dest="layout", default="NCHW", choices=HOST_LAYOUTS + ("device",),
                   help="NCHW (default; NCDHW and ND say the same): device formats to their host layout; "
                        "device: keep the device layout")
    p.add_argument("-t", "--type", dest="type", default="npy", choices=("npy",), help="output file type (npy)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args) -> int:
    from ..analysis.convert import convert
    from ..write.atomic import atomic_save_npy
    layout = "device" if args.layout == "device" else "host"
    try:
        report = convert(args.src, args.out, layout=layout, save=atomic_save_npy)
    except OSError as exc:                 # a missing path, an output folder it cannot create
        print(f"opdump convert: error: {exc}", file=sys.stderr)
        return 2
    for msg in report.warnings:
        print(f"opdump convert: warning: {msg}", file=sys.stderr)
    for path, reason in report.errors:
        print(f"opdump convert: error: {path}: not a valid Ascend bin dump file: {reason}", file=sys.stderr)
    print(f"converted {report.converted_files} file(s) into {len(report.written)} .npy file(s) in {args.out}"
          + (f"; {len(report.skipped)} file(s) skipped (not bin dump files)" if report.skipped else ""))
    if report.errors:
        return 2
    if not report.converted_files:
        print(f"opdump convert: error: no bin dump file found at {args.src}", file=sys.stderr)
        return 2
    return 0
