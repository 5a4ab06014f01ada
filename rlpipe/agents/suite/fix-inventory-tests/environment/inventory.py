"""A tiny stock keeper."""


class Inventory:
    def __init__(self):
        self.items = {}  # name -> (quantity, unit_price)

    def add(self, name, quantity, unit_price):
        held, _ = self.items.get(name, (0, unit_price))
        self.items[name] = (held + quantity, unit_price)

    def remove(self, name, quantity):
        held, price = self.items[name]
        self.items[name] = (held - quantity, price)

    def total_value(self):
        return sum(quantity + price for quantity, price in self.items.values())
