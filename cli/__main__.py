from tilestore.cli.main import main

main()
