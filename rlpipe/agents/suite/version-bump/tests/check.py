import configparser
import pathlib
import re
import sys

work = pathlib.Path("/work")
if work.joinpath("VERSION").read_text().strip() != "1.5.0":
    sys.exit("VERSION is not 1.5.0")
setup = configparser.ConfigParser()
setup.read(work / "setup.cfg")
if setup.get("metadata", "version", fallback=None) != "1.5.0":
    sys.exit("setup.cfg version is not 1.5.0")
if re.search(r'__version__\s*=\s*["\']1\.5\.0["\']', work.joinpath("pkg/__init__.py").read_text()) is None:
    sys.exit("pkg/__init__.py __version__ is not 1.5.0")
readme = work.joinpath("README.md").read_text()
if "Current version: 1.5.0" not in readme or "1.4.2" in readme:
    sys.exit("README.md does not say Current version: 1.5.0")
headings = re.findall(r"^## (\S+)", work.joinpath("CHANGELOG.md").read_text(), re.MULTILINE)
if headings[:3] != ["1.5.0", "1.4.2", "1.4.1"]:
    sys.exit(f"CHANGELOG.md headings are {headings}, expected 1.5.0 first, then 1.4.2, 1.4.1")
