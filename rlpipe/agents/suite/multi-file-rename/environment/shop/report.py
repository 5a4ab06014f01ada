from shop.orders import orders_by_name
from shop.users import get_user


def report():
    lines = [f"{name}: {total}" for name, total in sorted(orders_by_name().items())]
    lines.append(f"first customer: {get_user(1)}")
    return "\n".join(lines)
