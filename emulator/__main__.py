from .cli import main

if __name__ == "__main__":  # also keeps spawned children (the network process) from rerunning the CLI
    main()
