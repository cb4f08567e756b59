"""The console's pages, one module per page (and the actions taken from it); each offers
``routes(ctx)``."""
