"""The rules engine: rule files, the safe evaluator, windowed evaluation, reports."""
