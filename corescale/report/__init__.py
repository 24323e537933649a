"""What a person sees: console output, plots, the HTML report."""
