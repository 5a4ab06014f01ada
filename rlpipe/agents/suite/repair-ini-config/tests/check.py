import configparser
import sys

parser = configparser.ConfigParser(strict=True)
try:
    parser.read("/work/service.ini")
except configparser.Error as exc:
    sys.exit(f"service.ini does not load: {exc}")
expected = {"server": {"host": "0.0.0.0", "port": "8000", "timeout": "30"},
            "database": {"url": "postgres://db.internal:5432/app", "pool_size": "5"}}
got = {section: dict(parser[section]) for section in parser.sections()}
if got != expected:
    sys.exit(f"service.ini holds {got!r}, expected {expected!r}")
