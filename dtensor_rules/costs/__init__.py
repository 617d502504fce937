"""Placeholder package; see the issue tracker."""
