import sys

try:
    lines = open("/work/events.csv").read().splitlines()
except OSError:
    sys.exit("no events.csv")
if lines != ['id,user,action', '1,bo,view', '2,ana,view', '3,ana,view', '4,bo,login', '5,bo,login', '6,ana,view', '7,ana,logout', '8,ana,buy', '9,cy,login', '10,bo,login', '11,bo,buy', '12,cy,login']:
    sys.exit(f"events.csv holds {lines[:4]!r}...")
