"""The pure core: decisions over plain data, no I/O (the lead moves the other pure modules here)."""
