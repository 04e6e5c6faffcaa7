"""Git: poll, fetch only when the ref moved, credentials, atomic checkouts, signatures."""
