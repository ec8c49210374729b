#!/usr/bin/env python3
"""The repository cites only what it holds.

Every file git tracks (text only) is read, and it fails when:
  * a comment or document cites a design document the repository does not contain (the
    upstream design, reliability, method or style notes, or an issue tracker's numbers), or a
    path outside the repository (the parent folder's design notes);
  * a `docs/NAME.md` named anywhere, or a relative link between the documents, does not exist;
  * a numbered section of `docs/architecture.md` cited as `architecture.md ... §N` or `§N.M`
    is not there (sections are `## N.` headings, and the numbered steps of section 3);
  * a quoted section of a document (`docs/service.md, "Errors"`, `[`decisions.md`](...),
    "Layer scope"`) matches no heading of it, nor, for reliability.md, a property of its table;
  * `docs/method.md` does not define every claim C1-C23 that comments and reports cite.

Run from anywhere: `docs_test.py --root REPO`.
"""
import argparse
import os
import re
import subprocess
import sys

FOREIGN = [
    (re.compile(r"\bARCHITECTURE(\.md\b| ?§| \d)"), "the upstream design document"),
    (re.compile(r"\bRELIABILITY(\.md\b| R\d)"), "the upstream reliability list"),
    (re.compile(r"\bMETHOD(\.md\b| ?§| C\d| section|'s\b)"), "the upstream method notes"),
    (re.compile(r"\bSTYLE\.md\b"), "the upstream style guide"),
    (re.compile(r"\b[Ii]ssues? #?\d+"), "an issue number"),
    (re.compile(r"(^|[\s(,;])#\d+\b(?![\d.])"), "an issue number"),
    # Spelled in pieces so that this file does not contain the path it looks for.
    (re.compile(r"\.\." + "/" + r"shared\b"), "a path outside the repository"),
]
# Names quoted after a document: `docs/service.md, "Errors"`, (`service.md`, "Errors"),
# [`decisions.md`](decisions.md), "Layer scope", docs/service.md "Metrics".
QUOTED = re.compile(
    r"(?:docs/)?([a-z_]+)\.md`?(?:\]\([a-z_/.]+\.md\))?\)?,? (?:and docs/[a-z_]+\.md, )?\"([^\"]+)\"")
DOC_PATH = re.compile(r"\bdocs/([a-z_]+)\.md\b")
LINK = re.compile(r"\]\(([a-z_]+\.md)(#[^)]*)?\)")
ARCH_CITE = re.compile(r"architecture\.md`?\)?[^§\n]{0,3}((?:§[\d.]+(?:-§?[\d.]+)?(?:, |; )?)+)")
SECTION = re.compile(r"§(\d+)(?:\.(\d+))?")
CLAIM = re.compile(r"\bC(\d{1,2})(?:-C(\d{1,2}))?\b")


def tracked_files(root):
    """The files git tracks; outside a checkout, every file but build folders and .git."""
    listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True)
    if listed.returncode == 0:
        return [f for f in listed.stdout.decode().split("\0") if f]
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d != ".git" and not d.startswith("build")]
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
    return sorted(files)


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def headings(text):
    names = []
    for line in text.splitlines():
        m = re.match(r"#+\s+(?:\d+\.\s+)?(.*)", line)
        if m:
            names.append(m.group(1).strip())
    names += re.findall(r"^\| \*\*([^*]+)\*\* \|", text, flags=re.M)
    return names


def architecture_sections(text):
    sections = set()
    current = None
    for line in text.splitlines():
        m = re.match(r"## (\d+)\. ", line)
        if m:
            current = int(m.group(1))
            sections.add((current, None))
            continue
        m = re.match(r"(\d+)\. \*\*", line)
        if m and current is not None:
            sections.add((current, int(m.group(1))))
    return sections


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    root = os.path.abspath(parser.parse_args().root)
    docs = {}
    for name in os.listdir(os.path.join(root, "docs")):
        if name.endswith(".md"):
            docs[name[:-3]] = read_text(os.path.join(root, "docs", name))
    arch = architecture_sections(docs.get("architecture", ""))
    claims = {int(n) for n in re.findall(r"^\| C(\d+) \|", docs.get("method", ""), flags=re.M)}
    problems = []

    for path in tracked_files(root):
        if path.endswith(".csv") or path == "tests/docs/docs_test.py":
            continue
        text = read_text(os.path.join(root, path))
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path}:{number}"
            for pattern, what in FOREIGN:
                if pattern.search(line):
                    problems.append(f"{where}: cites {what}: {line.strip()}")
            for doc in DOC_PATH.findall(line):
                if doc not in docs:
                    problems.append(f"{where}: docs/{doc}.md does not exist")
            if path.startswith("docs/") and path.count("/") == 1:
                for target, _ in LINK.findall(line):
                    if target[:-3] not in docs:
                        problems.append(f"{where}: link to {target}, which does not exist")
            for cited in ARCH_CITE.findall(line):
                for major, minor in SECTION.findall(cited):
                    key = (int(major), int(minor) if minor else None)
                    if key not in arch:
                        problems.append(f"{where}: architecture.md has no §{major}"
                                        f"{'.' + minor if minor else ''}")
            for doc, name in QUOTED.findall(line):
                if doc not in docs:
                    continue
                if not any(h.startswith(name) or name.startswith(h) for h in headings(docs[doc])):
                    problems.append(f'{where}: {doc}.md has no section "{name}"')
            if "claim" in line or path.startswith(("docs/", "eval/model/realtrace")):
                for low, high in CLAIM.findall(line):
                    for n in range(int(low), int(high or low) + 1):
                        if n not in claims:
                            problems.append(f"{where}: claim C{n} is not defined in method.md")
    for n in range(1, 24):
        if n not in claims:
            problems.append(f"docs/method.md: claim C{n} has no row")
    for problem in problems:
        print(problem)
    print(f"docs_test: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
