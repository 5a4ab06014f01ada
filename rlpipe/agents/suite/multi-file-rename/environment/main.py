from shop.report import report

print(report())
