"""Generates the gRPC stubs while pip builds the package (the protos are not copied into the
source tree): protoc and grpc_python_plugin from PATH (Debian: protobuf-compiler,
protobuf-compiler-grpc), or ENTROKV_PROTOC / ENTROKV_GRPC_PYTHON_PLUGIN."""

import os
import pathlib
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTOS = ["entrokv/v1/types.proto", "entrokv/v1/cache_manager.proto"]


def _tool(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(f"entrokv: {name} is needed to generate the stubs (set {env})")
    return path


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        out = pathlib.Path(self.build_lib).resolve()
        (out / "entrokv" / "v1").mkdir(parents=True, exist_ok=True)
        (out / "entrokv" / "v1" / "__init__.py").touch()
        subprocess.run(
            [_tool("ENTROKV_PROTOC", "protoc"), f"--proto_path={PROTO_ROOT}",
             f"--python_out={out}", f"--grpc_out={out}",
             f"--plugin=protoc-gen-grpc={_tool('ENTROKV_GRPC_PYTHON_PLUGIN', 'grpc_python_plugin')}",
             *PROTOS],
            check=True, cwd=PROTO_ROOT)


setup(cmdclass={"build_py": BuildWithStubs})
