"""The ledger domain: what every node has, what every holder keeps, and the rules that
keep the sum of holdings within capacity.

The rules themselves are pure and live in app.core; here the repository, the commands,
the queries and the service put them on a SQL database.
"""
