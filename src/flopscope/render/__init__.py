"""The edge: human units (``units``), the table, markdown, JSON and CSV of a report
(``formats``), charts (``plot``). Nothing below this package knows about units or formats.
"""
