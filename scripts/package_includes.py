#!/usr/bin/env python3
"""Every file a published crate's source includes (`include_str!`, `include_bytes!`:
the guide's pages) is in the crate's package.

The test command packages the crates without building the packages (a build of the
packaged library took a minute of the command's time); what a packaged build would catch
beyond the manifest, which `cargo publish --dry-run` checks, is a file the source includes
but the package leaves out. This checks exactly that, from `cargo package --list`.
"""
import pathlib
import re
import subprocess
import sys

CRATES = {"dlock-rs": "dlock", "dlock-macros": "dlock-macros"}
INCLUDE = re.compile(r'include_(?:str|bytes)!\(\s*"([^"]+)"\s*\)')

root = pathlib.Path(__file__).resolve().parent.parent
missing = []
checked = 0
for package, folder in CRATES.items():
    crate = root / folder
    listed = subprocess.run(
        ["cargo", "package", "--list", "--allow-dirty", "-p", package],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout.split()
    listed = set(listed)
    for source in (crate / "src").rglob("*.rs"):
        for included in INCLUDE.findall(source.read_text()):
            path = (source.parent / included).resolve()
            try:
                in_package = str(path.relative_to(crate))
            except ValueError:
                missing.append(f"{source.relative_to(root)} includes {included}, outside {folder}/")
                continue
            checked += 1
            if in_package not in listed:
                missing.append(f"{source.relative_to(root)} includes {in_package}, not in the {package} package")
if missing:
    print("files the source includes but the package lacks:", *missing, sep="\n  ")
    sys.exit(1)
print(f"package_includes: {checked} included files, all in their packages")
