from deployer.cli import main

main()
