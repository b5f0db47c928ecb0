"""The ledger domain: what every node has, what every holder keeps, and the rules that
keep the sum of holdings within capacity.

The pure core (resources, records, arithmetic, errors) does no I/O; the repository and
the service put it on a SQL database.
"""
