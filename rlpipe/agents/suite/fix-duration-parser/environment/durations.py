"""Parse durations like 1h30m into seconds."""
import re


def parse_duration(text):
    total = 0
    for number, unit in re.findall(r"(\d+)([hm])", text):
        if unit == "h":
            total += int(number) * 3600
        elif unit == "m":
            total += int(number) * 3600
    return total
