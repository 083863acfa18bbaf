"""Job sets and arrays (issue 34): many gang jobs submitted once under one name.

A set is stored whole at submission (`records`, `store`); each member becomes an ordinary job with
its own quota, fair share, placement and ledger when it is released. An array's "at most N at once"
is a hold kept on the set record, released by the set controller (`controller`) as members end, so
the placer never sees more than N of them; the decision itself is pure (`decide`). The array range
grammar (`arrays`) and a set's status sums (`status`) are here too.
"""
