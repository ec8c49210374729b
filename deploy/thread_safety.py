"""That clang's thread-safety analysis covers every one of the project's units: the checked half
of every ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED and ABSL_LOCKS_EXCLUDED (g++ ignores
them).

Usage: python3 deploy/thread_safety.py BUILD_DIR

BUILD_DIR is a CMake build configured with clang++ and -DENTROKV_WERROR=ON (CI's sanitized
build, deploy/local.sh sanitize). The project's warning flags (cmake/EntrokvHelpers.cmake) add
-Wthread-safety under clang, so building BUILD_DIR is the analysis and a missing lock fails the
build. This script checks, before the build, that the analysis reaches every unit: each of the
project's own sources in compile_commands.json (not the generated protobuf code under a build
folder) must be compiled with -Wthread-safety and -Werror. A target that does not link the
warnings would otherwise go unchecked in silence. Prints the units that lack a flag and exits 1
if any does; 2 if the build has no compile_commands.json or no project unit.
"""

import json
import os
import shlex
import sys

REQUIRED_FLAGS = ("-Wthread-safety", "-Werror")


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


def missing_flags(entry):
    """The required flags the unit's compile command lacks."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    return [flag for flag in REQUIRED_FLAGS if flag not in args]


def main(argv):
    if len(argv) != 2:
        print("usage: python3 deploy/thread_safety.py BUILD_DIR", file=sys.stderr)
        return 2
    build_dir = argv[1]
    source_dir = os.environ.get("ENTROKV_SOURCE_DIR") or os.path.realpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    try:
        units = own_units(build_dir, os.path.realpath(source_dir))
    except FileNotFoundError as error:
        print(f"thread-safety: {error.filename} is missing (configure {build_dir} with CMake)",
              file=sys.stderr)
        return 2
    if not units:
        print(f"thread-safety: no project sources in {build_dir}/compile_commands.json",
              file=sys.stderr)
        return 2
    unchecked = [(name, flags) for name, entry in units if (flags := missing_flags(entry))]
    for name, flags in unchecked:
        print(f"thread-safety: {name} is compiled without {' '.join(flags)}", file=sys.stderr)
    if unchecked:
        print(f"thread-safety: {len(unchecked)} of {len(units)} units are not analysed (does "
              "their target link entrokv_warnings?)", file=sys.stderr)
        return 1
    print(f"thread-safety: all {len(units)} project units are compiled with "
          f"{' '.join(REQUIRED_FLAGS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
