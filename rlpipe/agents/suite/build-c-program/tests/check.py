import subprocess
import sys

for argv in (["make", "clean"], ["make"]):
    ran = subprocess.run(argv, cwd="/work", capture_output=True, text=True, timeout=60)
    if ran.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed: {ran.stderr[-400:]}")
ran = subprocess.run(["/work/bin/hello"], capture_output=True, text=True, timeout=10)
if ran.stdout != "Hello, rlpipe!\n":
    sys.exit(f"bin/hello printed {ran.stdout!r}")
sources = open("/work/src/greet.c").read()
if "Hello, %s!" not in sources:
    sys.exit("src/greet.c was changed")
