"""Clang's thread-safety analysis over the project's own sources: the checked half of every
ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED and ABSL_LOCKS_EXCLUDED (g++ ignores them).

Usage: python3 deploy/thread_safety.py BUILD_DIR [JOBS]

BUILD_DIR is a CMake build configured with clang++ (deploy/local.sh thread-safety does that),
whose compile_commands.json lists every translation unit. Each of the project's own sources in
it (not the generated protobuf code under BUILD_DIR) is compiled again with -fsyntax-only, the
build's own flags, and -Wthread-safety -Werror: the analysis runs on the parsed code, so no
object is generated and nothing is linked. Third-party headers (Abseil, gRPC, protobuf, the
generated code) are system headers to clang, whose warnings it does not report. Prints each
failing unit's diagnostics; exits 1 if any unit fails.
"""

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time

ANALYSIS_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror"]


def own_units(build_dir, source_dir):
    """The compile_commands.json entries of sources in the repository, not in a build folder
    (BUILD_DIR, or any build*/ folder of the repository: generated protobuf code)."""
    with open(os.path.join(build_dir, "compile_commands.json"), encoding="utf-8") as file:
        entries = json.load(file)
    build_dir = os.path.realpath(build_dir)
    units = []
    for entry in entries:
        path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
        if os.path.commonpath([path, build_dir]) == build_dir:
            continue
        if os.path.commonpath([path, source_dir]) != source_dir:
            continue
        relative = os.path.relpath(path, source_dir)
        if relative.split(os.sep)[0].startswith("build"):
            continue
        units.append((relative, entry))
    return sorted(units, key=lambda unit: unit[0])


def analysis_command(entry):
    """The unit's own compile command, minus its outputs, plus the analysis flags."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    command = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if arg in ("-c", "-MD", "-MMD"):
            continue
        command.append(arg)
    return command + ANALYSIS_FLAGS


def check(unit):
    name, entry = unit
    result = subprocess.run(analysis_command(entry), cwd=entry["directory"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            check=False)
    return name, result.returncode, result.stdout


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: python3 deploy/thread_safety.py BUILD_DIR [JOBS]", file=sys.stderr)
        return 2
    build_dir = sys.argv[1]
    jobs = int(sys.argv[2]) if len(sys.argv) == 3 else os.cpu_count() or 1
    source_dir = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))
    try:
        units = own_units(build_dir, source_dir)
    except FileNotFoundError as error:
        print(f"thread-safety: {error.filename} is missing (configure {build_dir} with CMake)",
              file=sys.stderr)
        return 2
    if not units:
        print(f"thread-safety: no project sources in {build_dir}/compile_commands.json",
              file=sys.stderr)
        return 2
    start = time.monotonic()
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for name, code, output in pool.map(check, units):
            if code != 0:
                failed.append(name)
                print(f"== {name}\n{output}", end="" if output.endswith("\n") else "\n")
    seconds = time.monotonic() - start
    if failed:
        print(f"thread-safety: {len(failed)} of {len(units)} units fail: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    print(f"thread-safety: {len(units)} units pass -Wthread-safety -Werror ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
