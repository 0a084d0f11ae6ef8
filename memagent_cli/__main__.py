from memagent_cli.cli import main

main()
