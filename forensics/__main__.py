from forensics.entry import main

main()
