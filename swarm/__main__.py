from swarm.cli import command

command()
