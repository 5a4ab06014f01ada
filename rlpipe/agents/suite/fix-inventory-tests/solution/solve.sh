#!/bin/sh
python3 - <<'PY'
import pathlib
path = pathlib.Path("/work/inventory.py")
source = path.read_text()
source = source.replace(
    "        held, price = self.items[name]\n        self.items[name]",
    "        held, price = self.items[name]\n        if quantity > held:\n            raise ValueError(f'only {held} {name} in stock')\n        self.items[name]")
source = source.replace("quantity + price for", "quantity * price for")
path.write_text(source)
PY
