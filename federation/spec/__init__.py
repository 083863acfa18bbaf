"""What users write: the TrainingJob manifest read safely under hard limits, its field rules
and canonical form, priority classes, and the name rules every room shares.

The bottom room: it imports no other room of federation.
"""
