import sys

try:
    lines = open("/work/emails.txt").read().splitlines()
except OSError:
    sys.exit("no emails.txt")
if lines != ['ana@example.org', 'ana@mail.test', 'bo@example.org', 'bo@mail.test', 'cy@example.org', 'dee@example.org', 'dee@mail.test', 'eli@mail.test', 'fay@example.org']:
    sys.exit(f"emails.txt holds {lines!r}")
