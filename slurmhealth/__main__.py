from slurmhealth.cli import main

main()
