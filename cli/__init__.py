"""The `tune` command line: the top floor. One root parser (`cli.main`), one module per command;
every package below is used from here, none imports back up."""
