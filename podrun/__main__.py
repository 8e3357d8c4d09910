from podrun.cli import main

main()
