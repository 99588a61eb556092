"""Model adapters: each one declares how its candidate action is produced, normalized and reduced."""
