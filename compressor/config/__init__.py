"""What a user configures, as immutable typed models: recipes (recipe.py), their steps
(steps.py), the rules on step order (order.py) and the accuracy gate (gate.py)."""
