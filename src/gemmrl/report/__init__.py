"""`gemmrl report`: tables, claims and plots rebuilt from committed result files."""
