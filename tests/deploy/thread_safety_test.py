#!/usr/bin/env python3
"""deploy/thread_safety.py on made-up compile_commands.json files: a project unit compiled
without -Wthread-safety or without -Werror fails the check by name; generated code under a build
folder and sources outside the repository are not the project's and are not checked."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "thread_safety.py"
CLANG = "clang++-14 -Wall -Wextra -Werror -Wthread-safety -std=c++20"


class ThreadSafetyCoverageTest(unittest.TestCase):
    def run_check(self, entries):
        with tempfile.TemporaryDirectory() as root:
            source = pathlib.Path(root, "src")
            build = source / "build-asan"
            build.mkdir(parents=True)
            rows = []
            for file, command in entries:
                rows.append({"directory": str(build), "file": str(source / file),
                             "command": f"{command} -c {source / file} -o x.o"})
            (build / "compile_commands.json").write_text(json.dumps(rows), encoding="utf-8")
            env = dict(os.environ, ENTROKV_SOURCE_DIR=str(source))
            return subprocess.run([sys.executable, str(SCRIPT), str(build)], env=env,
                                  capture_output=True, text=True, check=False)

    def test_every_unit_analysed_passes(self):
        result = self.run_check([("service/a.cc", CLANG), ("tests/b_test.cc", CLANG)])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("all 2 project units", result.stdout)

    def test_a_unit_without_the_analysis_fails_by_name(self):
        result = self.run_check([("service/a.cc", CLANG),
                                 ("bench/b.cc", "clang++-14 -Wall -Werror -std=c++20"),
                                 ("client/c.cc", "clang++-14 -Wthread-safety -std=c++20")])
        self.assertEqual(result.returncode, 1)
        self.assertIn("bench/b.cc is compiled without -Wthread-safety\n", result.stderr)
        self.assertIn("client/c.cc is compiled without -Werror\n", result.stderr)
        self.assertNotIn("service/a.cc", result.stderr)
        self.assertIn("2 of 3 units are not analysed", result.stderr)

    def test_generated_and_outside_sources_are_not_the_projects(self):
        result = self.run_check([("service/a.cc", CLANG),
                                 ("build-asan/proto/gen/x.pb.cc", "clang++-14 -std=c++20"),
                                 ("../elsewhere/y.cc", "clang++-14 -std=c++20")])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("all 1 project units", result.stdout)

    def test_a_build_without_project_units_is_refused(self):
        result = self.run_check([("build-asan/proto/gen/x.pb.cc", "clang++-14 -std=c++20")])
        self.assertEqual(result.returncode, 2)
        self.assertIn("no project sources", result.stderr)


if __name__ == "__main__":
    unittest.main()
