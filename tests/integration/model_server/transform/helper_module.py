"""Imported by my_handler.py: shows the unpacked code directory is importable."""
MODEL = "transform-model"
