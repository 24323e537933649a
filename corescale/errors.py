class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2."""
