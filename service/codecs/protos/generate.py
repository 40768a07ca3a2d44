"""Regenerate `inference_pb2.py` and `inference_pb2.pyi` from `inference.proto` (dev only: needs grpcio-tools).

    python -m service.codecs.protos.generate            # rewrite them in place
    python -m service.codecs.protos.generate --out DIR  # write them into DIR instead (the test compares)

The proto is compiled relative to the repository root, so the generated module names its file
`service/codecs/protos/inference.proto`: a path no other copy of the protocol uses.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTO = HERE / "inference.proto"
GENERATED = ("inference_pb2.py", "inference_pb2.pyi")


def generate(out: Path) -> list[Path]:
    """Compile the proto into `out` (a directory); the generated files' paths."""
    from grpc_tools import protoc  # dev dependency, imported only here

    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}", str(PROTO.relative_to(ROOT))]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {PROTO.name}")
        made = Path(tmp) / PROTO.parent.relative_to(ROOT)
        out.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copyfile(made / name, out / name)) for name in GENERATED]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write (default: beside the proto)")
    for path in generate(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
