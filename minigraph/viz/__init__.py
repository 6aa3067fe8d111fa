"""Seeing graphs: DOT text for Graphviz and matplotlib drawings."""
