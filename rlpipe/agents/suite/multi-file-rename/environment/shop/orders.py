from shop import users

_ORDERS = [(1, 30), (2, 12), (1, 5), (3, 7)]


def orders_by_name():
    totals = {}
    for user_id, amount in _ORDERS:
        name = users.get_user(user_id)
        totals[name] = totals.get(name, 0) + amount
    return totals
