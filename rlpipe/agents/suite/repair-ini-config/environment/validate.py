import configparser
import sys

parser = configparser.ConfigParser(strict=True)
try:
    parser.read("service.ini")
except configparser.Error as exc:
    sys.exit(f"service.ini does not load: {exc}")
for section, keys in {"server": {"host", "port", "timeout"}, "database": {"url", "pool_size"}}.items():
    if not parser.has_section(section) or set(parser[section]) != keys:
        sys.exit(f"[{section}] must hold exactly {sorted(keys)}")
print("service.ini is valid")
