from podrun.cli import run

run()
