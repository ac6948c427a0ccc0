"""tilestore.cli: the `tilestore` command (parses, prints, exits). The top floor: it reaches
the library only through the names its packages' public faces offer (`tilestore`,
`tilestore.embed`, `tilestore.plan`...), and decides nothing worth testing itself."""
