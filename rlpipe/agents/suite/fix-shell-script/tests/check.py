import pathlib
import subprocess
import sys

data = pathlib.Path("/work/data")
(data / "delta more notes.txt").write_text("1\n2\n")  # a new file the script must also count
ran = subprocess.run(["bash", "count.sh"], cwd="/work", capture_output=True, text=True, timeout=20)
if ran.stdout.strip() != "4 files, 11 lines":  # 3 + 2 + 4 + 2 lines
    sys.exit(f"count.sh printed {ran.stdout!r} {ran.stderr[-200:]!r}")
