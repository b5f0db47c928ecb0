"""Database plumbing shared by every domain: engines, sessions, migrations."""
