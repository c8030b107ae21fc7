"""What every other module stands on: atomic writes, the cache root, JSON values, the command runner, HTTP GET, secrets, signals, tables, versions, safe output folders, figures, launch records."""
