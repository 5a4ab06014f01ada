import unittest

from inventory import Inventory


class InventoryTest(unittest.TestCase):
    def test_total_value(self):
        stock = Inventory()
        stock.add("bolt", 10, 0.5)
        stock.add("nut", 4, 0.25)
        self.assertAlmostEqual(stock.total_value(), 6.0)

    def test_remove_too_many_raises(self):
        stock = Inventory()
        stock.add("bolt", 2, 0.5)
        with self.assertRaises(ValueError):
            stock.remove("bolt", 3)
        self.assertEqual(stock.items["bolt"][0], 2)


if __name__ == "__main__":
    unittest.main()
