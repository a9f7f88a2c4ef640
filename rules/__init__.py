"""The built-in rule files (*.yaml), installed as package data of gpuwatch.rules."""
