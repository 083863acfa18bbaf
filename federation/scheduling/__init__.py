"""The leader's loop: leader election, the snapshot and the scheduling cycle, the reconciler
(dispatch, status, restart policy, cancellation, lost clusters), the member clusters, and the
collection of what no current attempt needs.
"""
