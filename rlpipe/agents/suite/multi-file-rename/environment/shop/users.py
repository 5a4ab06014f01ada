_USERS = {1: "ada", 2: "grace", 3: "linus"}


def get_user(user_id):
    return _USERS[user_id]
