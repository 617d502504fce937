"""Integrations with other frameworks' trainers, each a module imported only by the trainer that names it."""
