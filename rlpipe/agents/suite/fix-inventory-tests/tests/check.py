import sys
sys.path.insert(0, "/work")
from inventory import Inventory

stock = Inventory()
stock.add("a", 3, 2.0)
stock.add("b", 5, 1.5)
stock.add("a", 1, 2.0)
if abs(stock.total_value() - 15.5) > 1e-9:  # 4 * 2.0 + 5 * 1.5
    sys.exit(f"total_value = {stock.total_value()}, expected 15.5")
try:
    stock.remove("b", 6)
except ValueError:
    pass
else:
    sys.exit("removing 6 of 5 did not raise ValueError")
if stock.items["b"][0] != 5:
    sys.exit("a refused removal changed the stock")
stock.remove("b", 5)
if stock.items["b"][0] != 0:
    sys.exit("removing all of b did not leave 0")
