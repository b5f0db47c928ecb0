"""The pure core: no database, HTTP or Kubernetes imports (an import-linter contract)."""
